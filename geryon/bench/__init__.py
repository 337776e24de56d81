"""Benchmarks that compose the layers: categorize + transport + emulate, measured end to end.

The layers know nothing of each other's internals (categorize does not import the transport or the
emulator, the transport knows nothing of the threshold search); a benchmark that needs all of them
together is a composition point, and lives here rather than inside one of them.

  cli            `geryon bench threshold|transport|allreduce|priority`
  sweep          the threshold search against the exhaustive sweep, with the analytic backend
  transport      `bench transport|allreduce|priority` on an emulated cluster
  transport_roles  the processes those run (`python -m geryon.bench.transport_roles ROLE`), also used
                 by the transport's failure tests; priority: the priority bench's two roles
  emulated       starts roles inside emulated hosts and collects their JSON lines
  replay_roles   the processes of a replayed-model PS job (`python -m geryon.bench.replay_roles
                 worker|server`), driven line by line over stdin/stdout
  threshold      `EmulatedThresholdBench`: the threshold search and the exhaustive sweep measured on
                 replayed VGG-19/ResNet-50 workers over the real transport on an emulated cluster
                 (`geryon bench threshold --backend emulated`)
  paper          `geryon bench paper`: the paper's scaling table on replayed models, 8 colocated hosts,
                 policies interleaved, one calibrated compute scale (paper_cli, paper_math: figures,
                 scaling and row arithmetic; paper_job: the live-switched job; paper_report: Markdown
                 and PNG; paper_trace: forward waits from its timelines)
"""
