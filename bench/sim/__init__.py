"""The simulator: policies, the run on a virtual clock, and its validation (cost tables are
``bench.cost_tables``, shared with the emulated engine; the command line is ``bench.simulate``)."""
