"""Module buffers (BatchNorm running statistics, ...) in PS mode: DDP's convention.

Parameters live on the parameter servers; buffers do not (they are not trained by the optimizer).
As DistributedDataParallel does with broadcast_buffers=True, every worker takes worker 0's buffers
before each forward pass in training mode (grad enabled, model.train()), one coalesced gloo
broadcast, so all workers hold identical buffers and a checkpoint from worker 0 has them.
torch.nn.SyncBatchNorm (statistics over the global batch) only runs on GPU/XPU tensors in PyTorch,
so distribute() refuses it on CPU modules (geryon.runtime.ddp_options).
"""

from geryon.gloo_buffers import KeptBuffers, broadcast_in_place


class BufferBroadcast:
    """Broadcast `model`'s floating and integer buffers from worker 0 before training forwards."""

    def __init__(self, model):
        self.model = model
        self.buffers = [b for b in model.buffers() if b.numel() > 0]
        self._kept = KeptBuffers()

    def __deepcopy__(self, memo):
        return self   # a copy of the model keeps the hook; it acts on the trained model only

    def hook(self, module, _args) -> None:
        """The model's forward pre-hook (a copy of the model, e.g. an AveragedModel's, broadcasts nothing)."""
        if module is self.model:
            self.before_forward()

    def before_forward(self) -> None:
        import torch
        import torch.distributed as dist

        if not self.buffers or not self.model.training or not torch.is_grad_enabled() \
                or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return
        broadcast_in_place(self.buffers, self._kept)
