"""``horovod.runner``, served by hpcddp: the launcher is ``horovodrun``
(``hpcddp.commands.horovodrun``)."""
