"""SpecLab benchmark harness: python -m bench --quick | --pair (see bench/README.md)."""
