module github.com/integrations-platform/integrations/migrations

go 1.26
