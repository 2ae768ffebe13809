"""``horovod``, served by hpcddp (``python -m hpcddp.horovod install-alias``; ``remove-alias``
takes it away): ``horovod.torch`` is ``hpcddp.horovod``."""

from hpcddp.version import __version__ as _hpcddp_version

# Horovod's last release, which the API follows, and hpcddp's version after the "+".
__version__ = f"0.28.1+hpcddp.{_hpcddp_version}"
