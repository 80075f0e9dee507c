"""Notebook 03's exercises (notebooks/03_chunked_prefill.ipynb): the steps a long prompt's prefill
takes, and the engine re-timed with the learner's token budget.
"""

from __future__ import annotations

import math

from course.checks import check_function, run_check
from course.noise import compare, interleaved_rounds
from course.predict import direction_of


def prefill_steps(prompt_tokens: int, budget: int, num_decodes: int) -> int:
    """Steps a prompt needs when decodes go first and its chunks fill the rest of the budget."""
    return math.ceil(prompt_tokens / (budget - num_decodes))


def check_03_prefill_steps(fn, quiet=False) -> str:
    cases = [((2000, 256, 8), 9), ((100, 64, 0), 2), ((64, 64, 0), 1), ((1000, 512, 12), 2), ((17, 10, 2), 3)]
    return check_function("03 steps to prefill a long prompt", fn, cases, quiet=quiet)


DIRECTIONS = ("lower", "higher")


def retime_03_budget(run, my_budget, predict_itl, predict_ttft, baseline: int = 256, rounds: int = 2,
                     quiet=False) -> str:
    """Notebook 03's live exercise: the engine re-timed with the learner's token budget.

    Args:
        run: ``run(budget)`` -> the notebook's arrival-run results (a dict with ``itl_p99_s``, the
            decoders' p99 inter-token latency, and ``newcomer_ttft_s``, both seconds).
        my_budget: the learner's ``max_num_batched_tokens`` (an int >= 16, not ``baseline``).
        predict_itl, predict_ttft: "lower" or "higher": how the learner expects the decoders' p99
            ITL and the newcomer's TTFT to move against ``baseline``.
        rounds: interleaved rounds of both budgets (>= 2, so that a verdict can be told from noise).
    Passes when every direction the rounds settle (``compare``: all rounds agree) is the predicted
    one; a direction the rounds leave unsettled is reported, not counted against the learner.
    """
    def test():
        for name, value in (("predict_itl", predict_itl), ("predict_ttft", predict_ttft)):
            if value not in DIRECTIONS:
                return False, f"{name}={value!r}: write 'lower' or 'higher'"
        if (not isinstance(my_budget, int) or isinstance(my_budget, bool) or my_budget < 16
            or my_budget == baseline):
            return False, (f"my_budget={my_budget!r}: choose a whole number of tokens >= 16 other than "
                           f"{baseline}")
        kept = {"yours": [], "baseline": []}

        def arm(name, budget):
            def one() -> float:
                kept[name].append(run(budget))
                return kept[name][-1]["itl_p99_s"]
            return one
        interleaved_rounds({"yours": arm("yours", my_budget), "baseline": arm("baseline", baseline)},
                           rounds=rounds)
        lines, wrong = [], []
        for key, label, guess in (("itl_p99_s", "decoders' p99 ITL", predict_itl),
                                  ("newcomer_ttft_s", "newcomer's TTFT", predict_ttft)):
            v = compare([r[key] for r in kept["yours"]], [r[key] for r in kept["baseline"]])
            lines.append(f"{label} {v.text('higher', 'lower')}")
            settled = direction_of(v)  # every round agreed, beyond the dead zone; None where they did not
            if settled is not None and settled != guess:
                wrong.append(f"the {label} came out {settled}, you predicted {guess}")
        text = f"budget {my_budget} against {baseline}, {rounds} interleaved rounds: " + "; ".join(lines)
        if wrong:
            return False, (text + ". " + "; ".join(wrong)
                           + ": which way does a bigger budget move a step's size?")
        return True, text + ". Every direction the rounds settled is the one you predicted."
    attempted = my_budget is not None or predict_itl is not None or predict_ttft is not None
    return run_check("03 re-time the engine with your token budget", test, attempted=attempted, quiet=quiet)
