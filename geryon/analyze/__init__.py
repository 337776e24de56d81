"""Timeline analytics: iteration metrics from a geryon Chrome trace (`geryon analyze TRACE.json`).

trace.py reads a trace into ranks, compute spans and transfers; metrics.py computes the Horovod
timeline study's metrics and Caramel's overlap/utilization per worker and iteration; plots.py
draws them; cli.py is the command.
"""
