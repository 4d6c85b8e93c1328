"""The disaggregated mode's Ray side: generator actors, the sample queue, the backend and its stream."""
