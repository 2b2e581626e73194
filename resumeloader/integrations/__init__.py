"""Integrations with training frameworks (Keras). Built on the loader's public interface only."""
