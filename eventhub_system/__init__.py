"""Placeholder package of the Azure suite; implemented by a later issue (see DESIGN.md)."""
