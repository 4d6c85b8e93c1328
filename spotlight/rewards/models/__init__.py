"""Learned preference rewards on local checkpoints: the LAION aesthetic predictor and HPSv2.1.

Each loads from local files only (`reward.models.*`), scores batches on `reward.device`, shares a loaded
backbone with any other reward naming the same folder (`cache.py`), and keeps its images per second
(`speed.py`). docs/rewards.md says which release each expects and how its score is computed.
"""
