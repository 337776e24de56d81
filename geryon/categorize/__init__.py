"""Categorize: rank parameters by urgency, split them into priority classes, search the threshold.

Knows nothing of the launcher or the transport: it produces an assignment (parameter name -> class
index, 0 = most urgent) and consumes iteration times.

  urgency.py   ranking from a real forward pass of a torch model
  profiles.py  per-layer profiles (.dag): parse, validate, forward order; derived.py: AlexNet from FLOPs
  zoo.py       built-in small CNNs
  classes.py   coarse and threshold splits into K classes; Assignment (JSON, digest)
  model.py     analytic iteration-time model (the slides' recursion; strict-priority links)
  fit.py       robust fit of iteration time vs threshold
  reduce.py    rank 0 decides on all ranks' times (local, torch.distributed)
  search.py    ThresholdSearch, used inside a training loop
  runrecord.py RUN.json schema; report.py PNG + Markdown
  replay.py    a worker's compute replayed from a profile, with per-layer hooks
  cli.py       geryon categorize / report threshold
  profiles_data/  the shipped per-layer profiles (source and licence in its README)
(The search-vs-sweep benchmark is in geryon.bench.sweep.)
"""
