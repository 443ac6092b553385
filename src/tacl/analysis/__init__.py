"""Analysis of the trained encoders: TaCL's layer-wise self-similarity."""
