"""Variables, outputs and the processors that compute them."""
