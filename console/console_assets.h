/*
 * console_assets.h - the console's pages, scripts and style, compiled in
 * (console/embed.cmake generates the table from console/www).
 */
#ifndef CONSOLE_ASSETS_H
#define CONSOLE_ASSETS_H

#include <stddef.h>

typedef struct {
  const char *path; /* "/console.js"; NULL ends the table */
  const char *content_type;
  const unsigned char *data;
  size_t len;
} console_asset_t;

extern const console_asset_t console_assets[];

#endif /* CONSOLE_ASSETS_H */
