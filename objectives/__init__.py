"""Objectives measured for each stitched network."""
