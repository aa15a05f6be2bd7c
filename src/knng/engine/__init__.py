"""The single-device engine: the plan, the threshold screen, the candidate stores and the exact finish."""
