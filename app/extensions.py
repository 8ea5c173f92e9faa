"""Extensions, created unbound; ``create_app`` binds them."""
from flask import g, has_request_context
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_sqlalchemy.session import Session
from sqlalchemy import MetaData

# Stable constraint names keep Alembic autogenerate and the drift test honest.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

FLEET_BIND = "fleet"


class RoutedSession(Session):
    """Worker traffic (fleet and job routes) runs on its own connection pool
    (DESIGN §12), so busy admin pages can never starve heartbeats, claims and
    uploads of connections, nor the other way round. The routes mark
    themselves with ``g.fleet_pool``; everything else uses the default pool.
    """

    def get_bind(self, mapper=None, clause=None, bind=None, **kwargs):
        if bind is None and has_request_context() and g.get("fleet_pool"):
            return self._db.engines[FLEET_BIND]
        return super().get_bind(mapper=mapper, clause=clause, bind=bind, **kwargs)


db = SQLAlchemy(metadata=MetaData(naming_convention=NAMING),
                session_options={"class_": RoutedSession})
migrate = Migrate()
