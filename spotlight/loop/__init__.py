"""The training loop's parts: rollout scoring, seed choice, evaluation, the random streams, the policy versions,
the initial policy, pretraining (the `Trainer` that runs them is `spotlight.trainer`)."""
