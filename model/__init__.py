"""SOLARIS models: the foundation model, the embedding autoencoder and the vertical model."""
