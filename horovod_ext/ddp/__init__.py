"""horovod_ext.ddp: horovod-ext's methods over torch.distributed, with no Horovod (the third adapter, beside
horovod_ext.torch and horovod_ext.tensorflow). backend.py is the plan's backend over a process group; the
framework-free core (compression/, compressors/, consensus/) and torch_common/ do the rest."""
