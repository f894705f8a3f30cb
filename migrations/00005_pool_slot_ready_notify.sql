-- +goose Up

-- Every replica keeps a view of the shapes a create could find a ready warm slot of
-- (internal/pool.View), so that it can refuse a client over its rate without asking
-- Postgres, and never while a slot of the create's shape is ready. A slot becoming
-- ready, by whatever writer, notifies the view at once: the payload is the slot's shape,
-- template/cpu_millis/memory_mib/disk_gib (a template name holds no '/').
-- +goose StatementBegin
CREATE FUNCTION space_pool_slot_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('space_pool_ready',
        NEW.template || '/' || NEW.cpu_millis || '/' || NEW.memory_mib || '/' || NEW.disk_gib);
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER pool_slot_ready AFTER INSERT OR UPDATE OF state ON pool_slots
    FOR EACH ROW WHEN (NEW.state = 'ready') EXECUTE FUNCTION space_pool_slot_ready();

-- +goose Down
DROP TRIGGER pool_slot_ready ON pool_slots;
DROP FUNCTION space_pool_slot_ready();
