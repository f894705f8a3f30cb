package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/internal/apikey"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/store"
)

const keysUsage = `usage:
  space-api keys create --client <client id> --name <what it is for>
  space-api keys list
  space-api keys revoke <key id>

create prints the new key once; only its SHA-256 is stored. A key speaks for its
client id, which must still be on the quota flag's allowlist to get its own limits.
`

// keys runs the `keys` subcommands against SPACE_DATABASE_URL.
func keys(ctx context.Context, cfg config.Config, args []string, stdout io.Writer, logger *slog.Logger) error {
	if len(args) == 0 {
		return errors.New(keysUsage)
	}
	pool, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := store.CheckMigrated(ctx, pool); err != nil {
		return err
	}
	ks := apikey.NewStore(pool, logger)

	switch args[0] {
	case "create":
		fs := flag.NewFlagSet("keys create", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		client := fs.String("client", "", "the client id the key speaks for")
		name := fs.String("name", "", "what the key is for, e.g. ci")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("keys create: %w\n%s", err, keysUsage)
		}
		k, secret, err := ks.Create(ctx, *client, *name)
		if err != nil {
			return fmt.Errorf("keys create: %w", err)
		}
		fmt.Fprintf(stdout, "id:     %s\nclient: %s\nname:   %s\nkey:    %s\n\nThe key is shown once; store it now. Send it as: Authorization: Bearer <key>\n",
			k.ID, k.Client, k.Name, secret)
		return nil
	case "list":
		list, err := ks.List(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCLIENT\tNAME\tCREATED\tLAST USED\tREVOKED")
		for _, k := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Client, k.Name, k.CreatedAt.UTC().Format(time.RFC3339), when(k.LastUsedAt), when(k.RevokedAt))
		}
		return tw.Flush()
	case "revoke":
		if len(args) != 2 {
			return errors.New(keysUsage)
		}
		if err := ks.Revoke(ctx, args[1]); err != nil {
			return fmt.Errorf("keys revoke: %w", err)
		}
		fmt.Fprintf(stdout, "revoked %s\n", args[1])
		return nil
	}
	return fmt.Errorf("unknown keys command %q\n%s", args[0], keysUsage)
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
