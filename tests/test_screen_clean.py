"""A pipeline folder end to end in a real terminal: transformers', diffusers' and tokenizers' output goes to the log.

`spotlight make-tiny-pipeline sd3 DIR` then a one-iteration `spotlight train -s model.pretrained=DIR` under a
pseudo-terminal (`script -qfc`, as a person would run them one after the other). Before, the screen showed
transformers' "`SiglipImageProcessor` requires torchvision" and "`CLIPImageProcessor` ..." lines from both
commands, diffusers' "Writing model shards" bars and tokenizers' "Token indices sequence length" notices; now
the screen holds Spotlight's own lines, and what the libraries said is in the log.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_tty_quiet import screen_lines  # what stays on a terminal's screen, read the same way

# What the three libraries print: their logger's prefix or names, their notices, tqdm's bars (" 40%|####  |").
THIRD_PARTY = re.compile(r"transformers|diffusers|tokenizers|huggingface|torchvision|Token indices|model shards|"
                         r"Loading (checkpoint|pipeline)|\d+%\|| it/s\]|s/it\]", re.IGNORECASE)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux's `script` for a pseudo-terminal")
def test_pipeline_folder_commands_show_no_third_party_lines(tmp_path: Path) -> None:
    folder, run_dir = tmp_path / "sd3", tmp_path / "run"
    spotlight = [sys.executable, "-m", "spotlight"]
    make = [*spotlight, "make-tiny-pipeline", "sd3", str(folder)]
    train = [*spotlight, "train", "-s", f"model.pretrained={folder}", "-s", "rollout.resolution=32",
             "-s", "mode=vanilla", "-s", "iterations=1", "-s", f"run_dir={run_dir}", "-s", "pin_devices=false",
             "-s", "rollout.prompts_per_iteration=2", "-s", "rollout.group_size=2", "-s", "rollout.num_steps=2",
             "-s", "train.num_minibatches=1", "-s", "eval.seeds_per_prompt=1", "-s", "eval.num_steps=2",
             "-s", "eval.prompts=2", "-s", "eval.grid_prompts=2", "-s", "eval.raw_model=false"]
    command = f"{shlex.join(make)} && {shlex.join(train)}"
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(Path(__file__).parents[1]))
    done = subprocess.run(["script", "-qfec", command, "/dev/null"], cwd=tmp_path, env=env, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=300)
    lines = screen_lines(done.stdout.decode("utf-8", errors="replace"))
    assert done.returncode == 0, "\n".join(lines[-30:])
    assert any(line.startswith("wrote a tiny sd3 pipeline") for line in lines), lines[:10]
    assert any(line.startswith("report written to") for line in lines), lines[-10:]
    third_party = [line for line in lines if THIRD_PARTY.search(line)]
    assert not third_party, "third-party lines on the screen:\n" + "\n".join(third_party[:20])
    if importlib.util.find_spec("torchvision") is None:  # the libraries did speak: into the run's log
        assert "requires torchvision" in (run_dir / "spotlight.log").read_text(errors="replace")
