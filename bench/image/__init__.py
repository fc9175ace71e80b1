"""The built image: its sizes layer by layer, the GPU diarizer's packages."""
