"""What the SQL stores share: the pool, statement execution, error mapping, the holders and
queue operations (``base``, ``holders``), and per dialect a module of named statements
(``sqlite``, ``postgresql``, ``mysql``)."""
