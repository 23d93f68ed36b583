"""The bodies of `tokenrouter tune`, `simulate` and `profile` (`cli_throughput.py` holds their signatures): one module
per command, the options and inputs they share in `common` and `options`."""

from tokenrouter.throughput.commands.common import SystemArgs
from tokenrouter.throughput.commands.profile import run_profile_command
from tokenrouter.throughput.commands.simulate import run_simulate
from tokenrouter.throughput.commands.tune import run_tune
from tokenrouter.throughput.commands.tune_rate import run_rate_tune

__all__ = ["SystemArgs", "run_profile_command", "run_rate_tune", "run_simulate", "run_tune"]
