"""Agent-ready images, made on a build host (`sciencebench images bake`): neither login node nor worker.

`recipes` renders how a harness is preinstalled (pure), `builder` runs it on
the build host's engine and pushes the result, `command` bakes a selection
and records it. The login node and the workers only read the record
(`sciencebench.core.agentimages`); nothing of theirs imports this folder.
"""
