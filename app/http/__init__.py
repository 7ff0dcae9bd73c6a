"""FastAPI plumbing shared by every router: dependency aliases, request-body rules, the page
cursor, the error handlers and their OpenAPI shapes, path parameters, the server's hardening
middlewares and health routes. No product logic here."""
