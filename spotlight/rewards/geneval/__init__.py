"""The GenEval reward: detector, colour classifier and the rules that turn detections into a score."""
