"""One model shared by many visitors: what a server needs and a notebook never loads.

The scheduler (`scheduler.py`) queues every visitor's forward passes and runs the decode steps
waiting together as ONE packed pass (continuous batching), each visitor keeping the numbers it
would get alone: the packed passes (`packed.py`, its eager twin `packed_twin.py`, prompt rows
`prompt_rows.py`) and the probes that check each path bit for bit before use. The scripted Llama
passes and the exact rows kernel they multiply through live in engine/fast/, which a lone
visitor's decode step uses too.
Around it: idle release of tabs left open (`idle.py`), the deployment's presets and caps
(`deployment.py`), the packed passes' measured distance from lone ones (`packed_parity.py`) and
what that distance does to a visitor's answer (`determinism.py`: the same prompt in changing company).

Importing this package registers nothing; the first scheduler made registers the packed
attention with transformers and builds (or finds) the kernel.
"""

from engine.fast import sum_order
from engine.serving.deployment import Deployment, deployment_from_env, documented_variables, redact_paths
from engine.serving.determinism import (
    CompanyRun,
    CompanyStep,
    DeterminismResult,
    LoneRun,
    LoneStep,
    ModeResult,
    PackedSpeed,
    PassRunner,
    ProductOrder,
    Progress,
    Sampling,
    SumOrder,
    at_once,
    decode_alone,
    decode_in_company,
    near_ties,
    packed_step_ms,
    product_in_two_shapes,
    random_company,
    repeated_experiment,
    sum_in_two_orders,
)
from engine.serving.idle import IdleReleaser
from engine.serving.packed import exact_rows_kernel_in_use, forward_packed, forward_prefills, packed_pass_path
from engine.serving.packed_parity import PackedDifference, measure_packed_difference
from engine.serving.scheduler import BATCHING, BATCHING_ENV, ForwardScheduler, SchedulerStats, batching_from_env

__all__ = [
    "BATCHING", "BATCHING_ENV", "CompanyRun", "CompanyStep", "Deployment", "DeterminismResult", "ForwardScheduler",
    "IdleReleaser", "LoneRun", "LoneStep", "ModeResult", "PackedDifference", "PackedSpeed", "PassRunner",
    "ProductOrder", "Progress", "Sampling", "SchedulerStats", "SumOrder", "at_once", "batching_from_env",
    "decode_alone", "decode_in_company", "deployment_from_env", "documented_variables", "exact_rows_kernel_in_use",
    "forward_packed", "forward_prefills", "measure_packed_difference", "near_ties", "packed_pass_path",
    "packed_step_ms", "product_in_two_shapes", "random_company", "redact_paths", "repeated_experiment",
    "sum_in_two_orders", "sum_order",
]
