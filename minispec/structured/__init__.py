"""Structured output: the grammar (grammar.py, llguidance) and the executor that masks verify rows,
proposes forced tokens and cuts refused drafts (grammar_executor.py). Taught in notebook 08."""
