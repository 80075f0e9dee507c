"""The messenger against the truck, measured: the experiments of notebooks 05 and 06 as functions.

A notebook cell states the run (which arms, which loads, which clock); the functions here run the
arms in interleaved rounds, draw the charts and word the verdicts, so each sentence a learner reads
is computed from the run beside it. ``LiveArms`` runs speculation arms on the live engine, each
against spec off on its own prompts; the ``report_*`` functions plot and print one experiment each.
Taught in notebooks/05_messenger_vs_truck.ipynb and notebooks/06_what_speculation_costs.ipynb.

The functions live in three modules, gathered here so that a notebook imports them from one place:
course.live_arms (``LiveArms``, ``verdict_notes``, the cached sweeps), course.crossover_reports
(notebook 05's reports, the crossover explorer, ``gpu_thresholds``) and course.cost_reports
(notebook 06's reports).
"""

from course.live_arms import (
    CONCURRENCY_TICKS, RESULTS_DIR, LiveArms, cached_bench, cached_curve, verdict_notes,
)
from course.crossover_reports import (
    RATIO_KEYS, crossover_explorer, gpu_thresholds, losing_from, report_gpu_crossover, report_live_crossover,
    report_sim_crossover, report_user_vs_fleet,
)
from course.cost_reports import (
    report_draft_cost, report_neighbours, report_quantized_crossover, report_tree_vs_chain,
)
