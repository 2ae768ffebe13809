"""The ``hpcddp`` command's tools that stand apart from training: ``doctor.py`` (checks
the MPI and torch set-up on every rank and measures MPI) and ``timeline_plot.py`` (draws
an ``HPCDDP_TIMELINE`` trace and measures how much reduction overlaps backward)."""
