"""gRPC stubs generated from api/agent.proto (make generate-python); do not edit."""
