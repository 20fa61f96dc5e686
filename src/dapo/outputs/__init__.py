"""What a run writes: the run directory, trackers, dumps, group records, progress, profiling."""
