"""Run several short `spotlight train` runs in one interpreter (imports and the Ray cluster paid once).

argv[1] is a JSON list of [config path or null, run_dir, [overrides...]]. Used by test_loop_disaggregated.py.
"""

import json
import sys

from spotlight.config import TrainConfig, load_config
from spotlight.runtime.spot.pools import LocalCluster
from spotlight.trainer import train

if __name__ == "__main__":
    cluster = LocalCluster()  # lent to every run: each starts only its own actors
    for config_path, run_dir, overrides in json.loads(sys.argv[1]):
        train(load_config(TrainConfig, config_path, [*overrides, f"run_dir={run_dir}"]))
        print(f"finished {run_dir}", flush=True)
    cluster.shutdown()
