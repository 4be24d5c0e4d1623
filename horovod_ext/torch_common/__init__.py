"""What both PyTorch adapters share, with no Horovod import: the native kernels' bindings (kernels.py) and the
backend contract's tensor primitives (tensors.py). horovod_ext.torch adds Horovod's collectives to them,
horovod_ext.ddp torch.distributed's."""
