"""The built-in trainer: a tensor- and data-parallel transformer trained with
torch.distributed inside the Ray worker actors (``worker``), canonical reshardable
checkpoints (``checkpoint``), and the user-entrypoint mode (``entrypoint``)."""
