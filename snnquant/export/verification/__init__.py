"""Checks of an exported network against its sources: spike-by-spike agreement with the float
model (:mod:`.agreement`), saturation (:mod:`.saturation`) and NIR's own equations
(:mod:`.nir_reference`)."""
