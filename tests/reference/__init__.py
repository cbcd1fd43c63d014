"""Reference implementations the tests hold the package's fast paths to: plain, slow versions that
compute the same results from scratch (``reference.simulator.ReferenceSimulator``)."""
