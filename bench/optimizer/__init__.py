"""ScheduleFree+: step time, norms, training quality, and the corpus of runs it trained."""
