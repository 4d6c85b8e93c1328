"""The training loop: the trainer and its iteration, rollout scoring, seed choice, evaluation, pretraining."""
