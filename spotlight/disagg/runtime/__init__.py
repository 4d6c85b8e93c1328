"""The disaggregated mode's Ray side: the generator actors and the sample queue (its backend is `spotlight.backends.disaggregated`)."""
