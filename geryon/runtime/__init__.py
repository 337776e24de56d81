"""What runs inside a rank: the half of a job that the launcher (geryon.launch) starts.

  env          RankEnv: the job as the launcher's variables (geryon.envvars) describe it, parsed once
  api          geryon.init() / geryon.distribute() / geryon.average() in the user's script
  ddp_sync     allreduce mode: DDP's buckets over geryon's ring allreduce, or per-class process groups
  class_groups --collectives nccl | nccl-ib | gloo-classes: one torch.distributed group per class
  ps_sync      ps mode, worker side: push gradients / pull parameters, per-layer waits
  server       ps mode, server side: `python -m geryon.runtime.server`
  engines      under torchrun / Slurm: the store, the workers' process group, server ranks serving in init()
  server_checkpoint  ps mode: the servers' checkpoints every K steps, and resuming from them
  priorities   which class each parameter gets, agreed by every rank
  search_sync  --priority search while training
  jobtransport the rank's TransportConfig, store and listen address, from its RankEnv
  store_blobs  large values in the job's TCPStore

The only contract with the launcher is the environment (geryon.envvars); nothing here imports
geryon.launch.
"""
