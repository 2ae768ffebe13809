"""The directory ``python -m hpcddp.horovod install-alias`` puts on ``sys.path``: a
``horovod`` package whose modules are hpcddp's (``horovod.torch`` is
``hpcddp.horovod``), for programs that say ``import horovod.torch as hvd``."""
