"""stitch_nas: NAS over stitched fragments of pretrained models."""
