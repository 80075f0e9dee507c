"""Model code (plain PyTorch) and loading of weights and tokenizers through transformers."""
