"""The ``lightstream`` command: ``lightstream serve [MODEL]`` runs the whole stack on this machine."""
