"""Search spaces: define-by-run functions trial -> StitchConfig."""
