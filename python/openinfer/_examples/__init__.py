"""Models the bundled examples build on first use (nothing downloaded), and what they share."""
