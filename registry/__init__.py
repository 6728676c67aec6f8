"""The model registry: immutable, versioned entries with lineage, on the object store."""
