"""A pytest plugin: scikit-learn's neighbour estimators replaced by knng's before its own tests
import them (``tests/test_sklearn_suite.py`` runs scikit-learn's neighbour tests with it)."""

import sklearn.neighbors as sklearn_neighbors

import knng.estimators as knng_estimators

#: The classes substituted, by name, in ``sklearn.neighbors``.
SUBSTITUTED = ("NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor", "KNeighborsTransformer",
               "RadiusNeighborsClassifier", "RadiusNeighborsRegressor", "RadiusNeighborsTransformer")


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    for name in SUBSTITUTED:
        setattr(sklearn_neighbors, name, getattr(knng_estimators, name))
