"""Development tooling that the wheel does not ship: the end-to-end demo (``make demo``) and a
local Apache Kafka broker for the demo, the tests and the benchmarks. It imports memwal;
memwal never imports it (the import contract in ``pyproject.toml``)."""
