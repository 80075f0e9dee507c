"""Reference answers and check functions for the notebooks' exercises.

Each ``check_*`` function takes the learner's answer (``None`` = not attempted) and returns
"pass", "fail" or "not attempted" (see course.checks). Expected values are computed
from formulas here, never typed in, so the checks follow the inputs the notebook used.
The engine exercises (``check_02_admission_in_engine``, ``check_04_verify_in_engine``,
``check_04_policy_in_engine``) run the learner's code inside the real engine, through the seams
it offers (a Scheduler subclass, the Drafter protocol, a SpecPolicy), and judge it by what the
engine's own tests check: greedy speculation equals plain decoding token for token, every block
comes back, and the step records and request metrics show the rule at work.

One module per notebook holds its exercises (``quickstart`` for 00, ``memory_bound`` 01,
``continuous_batching`` 02, ``chunked_prefill`` 03, ``speculative_decoding`` 04,
``messenger_vs_truck`` 05, ``speculation_costs`` 06, ``policies`` 07, ``json_routes`` 08,
``capstone`` 09, ``packed_device`` 10); ``harness`` holds what they share: the small engine the
engine exercises run in, the seams that put the learner's code inside it, and the simulator's H100.
This package re-exports every name: ``from course.exercises import check_04_greedy_verify`` works.
"""

from course.exercises.harness import (
    H100, AdmissionRuleScheduler, LearnerGatherRunner, LearnerPolicy, LearnerVerifyDrafter, _course_prompts,
    _engine,
    _first_difference, _generate, h100_cost, tiny_course_model,
)
from course.exercises.quickstart import check_00_roofline, decode_roofline_tok_s
from course.exercises.memory_bound import (
    MATMUL_OPS, PARTS, check_01_gather_in_engine, check_01_ridge, check_01_step_split,
    reference_gather_context, reference_step_split, ridge_point_tokens,
)
from course.exercises.continuous_batching import (
    check_02_admission_in_engine, check_02_static_waste, reference_shortest_prompt_first, run_admission,
    simulated_admission_ttft, static_batching_slot_steps,
)
from course.exercises.chunked_prefill import (
    DIRECTIONS, check_03_prefill_steps, prefill_steps, retime_03_budget,
)
from course.exercises.speculative_decoding import (
    check_04_expected_tokens, check_04_greedy_verify, check_04_policy_in_engine, check_04_verify_in_engine,
    expected_speedup, expected_tokens_per_step, reference_choose_k, reference_greedy_verify,
)
from course.exercises.messenger_vs_truck import (
    USER_FLEET_GRID, best_fleet_under_promise, check_05_crossover, check_05_user_fleet,
    reference_crossover_concurrency, reference_first_losing_concurrency, user_fleet_table,
)
from course.exercises.speculation_costs import (
    TREE_COST_CURVES, _interpolated, check_06_neighbour_slowdown, check_06_tree_cost, reference_tree_cost,
    simulated_neighbour_slowdown,
)
from course.exercises.policies import check_07_thrash, check_07_threshold, reference_threshold
from course.exercises.json_routes import (
    _TOY_CUTS, _cut_run, _toy_allowed, check_08_draft_cut, check_08_json_route, simulated_speedup,
    simulated_tok_s,
)
from course.exercises.capstone import check_09_policy
from course.exercises.packed_device import check_10_prefix_saving, prefill_tokens_saved
