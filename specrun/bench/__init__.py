"""`specrun bench`: speculative methods against plain decoding on a set of prompts.

prompts (what to run) -> methods (which drafters and k) -> runner (timed runs, as
records) -> results (medians, speed-ups, recommendation) -> view / files / plot.
"""
