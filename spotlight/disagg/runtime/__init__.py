"""The disaggregated mode's Ray side: the generator actors and the sample queue.

Its backend is `spotlight.backends.disaggregated`.
"""
