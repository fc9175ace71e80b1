"""Build-time scripts: fetch the model(s) baked into the image. Nothing here runs per job."""
