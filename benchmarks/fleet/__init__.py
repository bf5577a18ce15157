"""`make bench-fleet`: a fleet of emulated GPU pods behind nginx, scaled by the HPA algorithm."""
